import sys

from ggflow.cli import main

sys.exit(main())
