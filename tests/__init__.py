from pathlib import Path

# A tiny committed ForeLen-style dataset (real samples of the embedded model): fixed input for tests.
FORELEN_TINY = Path(__file__).parent / "fixtures" / "forelen_tiny"
# The converted embedded model (setup.sh makes it). Tests that need it fail without it, never skip:
# a broken conversion must show red in CI.
MODEL_DIR = Path(__file__).resolve().parent.parent / "models" / "SmolLM2-135M-Instruct"
