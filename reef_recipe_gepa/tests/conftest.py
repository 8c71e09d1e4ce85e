"""dspy's model client (litellm) must not fetch its price list: the tests run offline."""

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
