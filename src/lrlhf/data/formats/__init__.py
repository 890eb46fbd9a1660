"""Input formats -> normalised records (:mod:`lrlhf.data.records`), with a summary of counts.

One format is one small reader function, registered for one record kind with the fields it needs.
:func:`load_records` reads a source, picks the format from the first record's keys (or ``format=``),
runs the reader on every row and returns the records and a :class:`~lrlhf.data.summary.DataSummary`.

Kinds and formats (``FORMATS[kind]`` lists them in detection order):

- ``sft``: ``messages`` ``{"messages": [{role, content}]}``; ``sharegpt`` ``{"conversations":
  [{from, value}], "system"?}`` (from: human/user, gpt/assistant, system); ``alpaca`` ``{instruction,
  input?, output, system?, history?}`` (user turn = instruction, then a newline and the input when it is
  not blank, as LLaMA-Factory joins them); ``self_instruct`` ``{instruction, instances: [{input, output}]}``
  (the *first* instance only, joined like alpaca, so one instruction never yields several prompts that a
  prompt split could separate); ``prompt_completion`` ``{prompt, completion}`` (strings or message lists).
- ``preference``: ``sharegpt_pairwise`` ``{conversations, chosen: {from, value}, rejected: {...}}``;
  ``hh_rlhf`` ``{chosen: transcript, rejected: transcript}`` with ``\\n\\nHuman:`` / ``\\n\\nAssistant:``
  markers; ``pairwise`` ``{prompt?, chosen, rejected, tie?, target?}``. ``target`` is P(chosen wins) in
  [0, 1]; ``"tie": true`` means 0.5.
- ``ranking``: ``{prompt, completions: [...], ranks: [int, ...]}``, lower is better (0- or 1-based: only the
  order counts), equal ranks are ties.
- ``prompt``: ``{"prompt": str | messages}``, or any SFT format, whose prompt is everything before the
  last assistant turn.

Rules every reader follows:

- A string prompt becomes one user message, a string completion one assistant message.
- Top-level keys a format does not use are kept in the record's ``meta`` (the toy world keeps task data
  there); ``source`` is the file or dataset name.
- A prompt must end with a user turn; a continuation must start with an assistant turn; ``system`` may
  only come first. Consecutive turns of one role are accepted (real data has them, e.g. 4 HH-RLHF prompts);
  a chat template that insists on alternation will say so at tokenisation.
- **Shared-prefix rule** (``hh_rlhf``, and ``pairwise`` given full conversations and no prompt): each side
  is cut before its *last* assistant turn; when both cut-off prefixes are equal, that prefix is the prompt
  and the rest of each side (the last assistant turn) is the continuation. Otherwise the pair has no
  shared prompt and is dropped, counted as ``no_shared_prefix``: its two sides answer different
  conversations, so its label is not a preference between two answers to one prompt. (HH-RLHF
  harmless-base test: 2,307 of 2,312 pairs share a prefix, 5 are dropped.) HH turns are stripped of
  surrounding whitespace.
- Skippable records are dropped and counted: identical chosen and rejected (``drop_identical``), an SFT
  example whose last assistant turn is blank (nothing to imitate), a ranking whose candidates all share one
  rank (``all_ranks_tied``: it orders nothing; a ranking with one strict preference is kept whole, its equal
  ranks are ties). A source with nothing left is an error. An empty *preference* continuation is
  kept: an empty answer can rightly win or lose (HH-RLHF has four such chosen answers).
- Anything else that does not fit raises :class:`~lrlhf.data.format_errors.DataFormatError` naming the record,
  the field, and the formats (or roles, or range) accepted.

More formats:

- ``preference``: ``chosen_rejected_messages`` ``{chosen_messages: [...], rejected_messages: [...]}``
  (LLaMA-Factory v1's DPO/RM files; contents may be typed parts, ``loss_weight`` is not needed: the continuation is
  the last assistant turn, by the shared-prefix rule).
- ``kto``: ``kto_messages`` ``{messages, label: bool}`` (LLaMA-Factory's KTO files: the last assistant turn is the
  labelled answer) and ``kto`` ``{prompt, completion, label: bool}`` (TRL's unpaired format), read into
  :class:`~lrlhf.data.records.UnpairedExample` for an unpaired loss. An SFT reader refuses such a row by name.
- ``prompt``: every preference format: a pair's prompt (HH-RLHF pairs serve as RL prompts).

One module per group of kinds (:mod:`.sft_readers`, :mod:`.pair_readers`, :mod:`.unpaired_readers`,
:mod:`.prompt_readers`), each registering its readers in :mod:`.registry` when imported; :mod:`.reading` reads a
source.
"""

from __future__ import annotations

from lrlhf.data.format_errors import DataFormatError
from lrlhf.data.formats import pair_readers, sft_readers, unpaired_readers  # noqa: F401  (each registers its readers)
from lrlhf.data.formats.pair_readers import LABEL_KEYS
from lrlhf.data.formats.prompt_readers import register_prompt_forms
from lrlhf.data.formats.reading import Record, choose_format, load_records, read_record
from lrlhf.data.formats.registry import ALL_TIED, FORMATS, KINDS, Format, supported_formats
from lrlhf.data.records import PREFERENCE_KINDS
from lrlhf.data.writers import write_jsonl

register_prompt_forms()  # every SFT and preference format is also read as a prompt

__all__ = ["ALL_TIED", "FORMATS", "KINDS", "LABEL_KEYS", "PREFERENCE_KINDS", "DataFormatError", "Format", "Record",
           "choose_format", "load_records", "read_record", "supported_formats", "write_jsonl"]
