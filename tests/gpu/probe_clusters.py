import dataclasses, torch
from omni_runtime.executor import moe_experts as m
from cuda.bindings import driver
p = m.plan(hidden=2048, inter=768, experts=128, top_k=8, normalize=True, multiprocessors=torch.cuda.get_device_properties(0).multi_processor_count)
for c in (2, 4, 8, 16):
    q = dataclasses.replace(p, cluster=c) if c != 2 else None
    if q is None:
        continue
    _mod, fn = m._function(q, 0)
    if c == 16:
        driver.cuFuncSetAttribute(fn, driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
    err, most = driver.cuOccupancyMaxActiveClusters(fn, m.launch_config(q.blocks, q.threads, q.shared_bytes, cluster=c))
    print("cluster", c, "max active clusters", most, err, "needed", q.blocks // c)
