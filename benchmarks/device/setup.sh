# Sourced at the repo root on the GPU machine: the carried wheels and bubblewrap, NVLink multicast kept off.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
if [ ! -f /tmp/site/.done ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && touch /tmp/site/.done || return 1
fi
export PYTHONPATH=/tmp/site
# bubblewrap in a folder of its own: unpacking debs into / broke the image's /lib once (docs/pkb.md).
if [ ! -x /tmp/bwrap-root/usr/bin/bwrap ]; then
  mkdir -p /tmp/bwrap-root && for f in .whl/*.deb; do dpkg -x "$f" /tmp/bwrap-root; done
fi
export PATH=/tmp/bwrap-root/usr/bin:$PATH
export LD_LIBRARY_PATH=/tmp/bwrap-root/lib/x86_64-linux-gnu:/tmp/bwrap-root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
