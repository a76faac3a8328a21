import sys

from nezha.cli import main

sys.exit(main())
