import sys

from minisgl.course.cli import main

sys.exit(main())
