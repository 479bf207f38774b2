"""`python -m evaluator ...`: the stable entry point (a design contract). This file is the
command-line shell's launcher, not part of the grading core: the shell lives in cli/."""
import sys

from cli.main import main

sys.exit(main())
