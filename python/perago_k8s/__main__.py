import sys

from perago_k8s.cli import main

sys.exit(main())
