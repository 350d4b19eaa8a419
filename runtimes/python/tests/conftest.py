import sys
from pathlib import Path

PYTHON_RUNTIME = Path(__file__).resolve().parent.parent
REPO = PYTHON_RUNTIME.parent.parent

# Tests run from the repository root: make the staccato package importable.
if str(PYTHON_RUNTIME) not in sys.path:
    sys.path.insert(0, str(PYTHON_RUNTIME))
