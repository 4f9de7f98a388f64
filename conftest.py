"""Repository-wide test setup: the shared test helpers in ``tests/support`` (``verl_test_models``: the one
way tests build tiny tokenizers and model folders) are importable from every package's test tree and from
the processes tests spawn (they inherit ``sys.path``)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "tests", "support"))
