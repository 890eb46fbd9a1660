import subprocess
import sys

HEAVY = (
    "lightning",
    "pytorch_lightning",
    "lightning_fabric",
    "transformers",
    "peft",
    "hydra",
    "omegaconf",
    "wandb",
    "datasets",
    "bitsandbytes",
)


def test_functional_imports_no_framework():
    code = (
        "import sys, lrlhf.functional\n"
        f"heavy = {HEAVY!r}\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & set(heavy)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
