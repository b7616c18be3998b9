import sys

from fedpriv.cli import main

sys.exit(main())
