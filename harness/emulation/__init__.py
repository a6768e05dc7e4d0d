"""Multi-GPU kernels checked on one GPU: W rank processes share a device, collectives run on the host
backend (harness.emulation.collectives), and torch's symmetric memory is emulated with CUDA IPC
(docs/emulation.md).

In a rank process, once the gloo group exists and before the candidate is imported:

    from harness.emulation import install
    install()            # or install(store=...) to exchange IPC handles through another store

On the trusted side, `harness.emulation.errors` (no torch needed) recognises refusals
(`not available in emulation: ...`) and `harness.emulation.layout` places ranks on GPUs. Multicast is
emulated without multicast: `multimem_rewrite` (pure Python) turns multimem instructions into unicast
accesses, `build_hook` applies it where torch builds, `multimem_scan` checks the binaries, and
`rewrite_record` reads back which builds were rewritten, for the result.

May import: common.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harness.emulation.errors import PREFIX, NotAvailableInEmulation, Refusal, parse_refusal, refusal_is_plausible

if TYPE_CHECKING:
    from harness.emulation.installer import install, installed, uninstall

__all__ = ["PREFIX", "NotAvailableInEmulation", "Refusal", "install", "installed", "parse_refusal",
           "refusal_is_plausible", "uninstall"]
_INSTALLER = ("install", "installed", "uninstall")


def __getattr__(name: str) -> Any:
    if name in _INSTALLER:
        # Deferred on purpose: the installer imports torch, and the trusted side (layout, errors: the CLI,
        # the judge) imports this package without needing it.
        from harness.emulation import installer

        return getattr(installer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
