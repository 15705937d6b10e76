"""On PYTHONPATH, makes the packages the GPU device image lacks unimportable (Ray, the Redis
client, FastAPI and their kind), as they are there: the GPU check's dry run in CI and its
mimic of the device (`scripts/gpu_check.sh`) run with it."""

import sys

MISSING = {"ray", "redis", "fastapi", "starlette", "uvicorn", "websockets", "locust"}


class _Missing:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in MISSING:
            raise ModuleNotFoundError(f"No module named {name!r} (the GPU machine has none)", name=name)
        return None


sys.meta_path.insert(0, _Missing())
