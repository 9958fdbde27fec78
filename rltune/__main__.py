import sys

from rltune import main

sys.exit(main())
