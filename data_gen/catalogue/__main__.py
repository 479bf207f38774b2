"""`python -m data_gen.catalogue jaxbench:PATH`: the launcher of checkout.main."""
import sys

from data_gen.catalogue.checkout import main

sys.exit(main())
