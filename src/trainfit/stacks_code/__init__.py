"""Other programs' training code, vendored unchanged (each sub-package names its source, commit and licence)
so that ``trainfit measure --stack S`` steps the stack's own code on fake tensors. Nothing here is imported
by trainfit's core: only :mod:`trainfit.measure.stacks` imports it, lazily (it needs torch)."""
