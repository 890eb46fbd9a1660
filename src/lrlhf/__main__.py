"""``python -m lrlhf VERB ...`` is the ``lrlhf`` command (:mod:`lrlhf.run.verbs`)."""

from lrlhf.run.verbs import main

if __name__ == "__main__":
    raise SystemExit(main())
