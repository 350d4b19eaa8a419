import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TOOLS = os.path.dirname(os.path.dirname(HERE))
for p in (HERE, TOOLS):
    if p not in sys.path:
        sys.path.insert(0, p)
