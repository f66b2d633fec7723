"""Triton kernels mirroring the emulator, imported as ``fpsim.kernels``.

Every kernel here has an emulator twin with the same signature and is compared with it bit
for bit (see DESIGN.md). The emulator never imports this package; torch and triton are
imported lazily by the kernel modules themselves.
"""
