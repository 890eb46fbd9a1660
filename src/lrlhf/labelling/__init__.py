"""People in the loop: the preference-labelling page (``lrlhf label <file>``, docs/labelling.md).

:mod:`~lrlhf.labelling.store` keeps the labels (append-only logs per annotator, the labelled file written
atomically), :mod:`~lrlhf.labelling.agreement` measures their quality, :mod:`~lrlhf.labelling.app` is the page
(Flask), :mod:`~lrlhf.labelling.command` the command and :mod:`~lrlhf.labelling.annotator` the iterative loop's
annotator that serves the page for a round (``rounds/annotator=web``).
"""
