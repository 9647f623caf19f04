"""``python -m crop`` is the ``crop`` command."""
from crop.workflow.cli import main

if __name__ == "__main__":
    main()
