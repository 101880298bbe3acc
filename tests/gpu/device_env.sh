# Sourced by the device scripts (run from the repo root on the device machine): the carried wheels
# (.whl) installed beside the device's torch and transformers, and the repo's packages on the path.
pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD/operator:$PWD/runtime PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
