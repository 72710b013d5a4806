from pathlib import Path

# A tiny committed ForeLen-style dataset (real samples of the embedded model): fixed input for tests.
FORELEN_TINY = Path(__file__).parent / "fixtures" / "forelen_tiny"
