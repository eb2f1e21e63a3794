from refkern.cli import main

raise SystemExit(main())
