import os

# Tests run on the CPU; keep XLA from grabbing every core's threads twice over.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
