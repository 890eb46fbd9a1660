"""``python -m lrlhf.labelling <file>``: the same as ``lrlhf label <file>``."""

from lrlhf.labelling.command import main

if __name__ == "__main__":
    raise SystemExit(main())
