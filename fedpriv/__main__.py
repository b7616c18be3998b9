import sys

if len(sys.argv) > 1 and sys.argv[1] == "audit":
    from fedpriv.audit import main as audit_main

    sys.exit(audit_main(sys.argv[2:]))

from fedpriv.cli import main

sys.exit(main())
