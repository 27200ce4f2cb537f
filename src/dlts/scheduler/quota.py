"""CPU and memory quotas, and the cores and memory a GPU node keeps for its GPUs (pure).

* **Effective CPU-only quota of a VC.** Cores: ``Vc.cpu_quota`` when set; else ``quota["cpu"]``
  (the CPU-only SKU's quota is cores); else *derived* from the VC's GPU quota and the node shape of
  each SKU (``gpus / gpus_per_node`` of its cores). Memory: ``Vc.memory_quota_bytes`` when set;
  else ``quota["cpu"]`` cores at the CPU-only node shape's bytes per core; else derived from the
  GPU quota the same way. The derived values are enforced exactly like explicit ones: a VC with no
  quota at all runs no non-preemptible CPU-only work. The portal and API show these numbers.
* **Reserved for GPUs.** A CPU-only job on a GPU node may use only the cores and bytes not reserved
  for the node's free GPUs: after placing it, ``free cores >= cpu_per_gpu x free GPUs`` and
  ``free bytes >= memory_per_gpu x free GPUs`` must still hold. ``cpu_per_gpu`` and
  ``memory_per_gpu_bytes`` come from the SKU (config ``sku_reserve``), default the proportional
  share, so a GPU job that asks at most that much per GPU can always start on a node whose GPUs
  are free, whatever CPU-only work other VCs put there.
"""

from __future__ import annotations

from collections.abc import Mapping

from dlts.scheduler.model import CPU_SKU, Node, SkuShape, Vc


def derived_cpu_memory(quota: Mapping[str, int], skus: Mapping[str, SkuShape]) -> tuple[float, int]:
    """Cores and bytes that go with a GPU quota: each SKU's share of whole-node cores and memory."""
    cpu, memory = 0.0, 0
    for sku, gpus in quota.items():
        shape = skus.get(sku)
        if sku == CPU_SKU or shape is None or shape.gpus <= 0:
            continue
        cpu += shape.cpu * gpus / shape.gpus
        memory += int(shape.memory_bytes * gpus / shape.gpus)
    return round(cpu, 3), memory


def effective_cpu_memory_quota(vc: Vc, skus: Mapping[str, SkuShape]) -> tuple[float, int, str, str]:
    """(cores, bytes, cores source, bytes source) a VC's non-preemptible CPU-only jobs may hold.

    Sources are ``override`` (set on the VC), ``cpu_sku`` (from ``quota["cpu"]``) or ``derived``."""
    derived_cpu, derived_mem = derived_cpu_memory(vc.quota, skus)
    cpu_sku_cores = vc.quota.get(CPU_SKU)
    if vc.cpu_quota is not None:
        cores, cores_src = float(vc.cpu_quota), "override"
    elif cpu_sku_cores is not None:
        cores, cores_src = float(cpu_sku_cores), "cpu_sku"
    else:
        cores, cores_src = derived_cpu, "derived"
    if vc.memory_quota_bytes is not None:
        mem, mem_src = int(vc.memory_quota_bytes), "override"
    elif cpu_sku_cores is not None:
        shape = skus.get(CPU_SKU)
        per_core = shape.memory_bytes / shape.cpu if shape is not None and shape.cpu > 0 else 0
        mem, mem_src = int(cpu_sku_cores * per_core), "cpu_sku"
    else:
        mem, mem_src = derived_mem, "derived"
    return cores, mem, cores_src, mem_src


def gpu_reserve(node: Node, skus: Mapping[str, SkuShape]) -> tuple[float, int]:
    """Cores and bytes kept for each free GPU of ``node`` (0, 0 on CPU-only nodes)."""
    if node.gpus <= 0:
        return 0.0, 0
    shape = skus.get(node.sku)
    cpg = shape.cpu_per_gpu if shape is not None and shape.cpu_per_gpu is not None else node.cpu / node.gpus
    mpg = (
        shape.memory_per_gpu_bytes
        if shape is not None and shape.memory_per_gpu_bytes is not None
        else node.memory_bytes // node.gpus
    )
    return float(cpg), int(mpg)
