from petmodel.cli import main

raise SystemExit(main())
