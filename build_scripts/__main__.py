import sys

from build_scripts.cli import main

sys.exit(main())
