"""The detailed memory method: the peak of one steady-state training step, derived from how PyTorch
allocates it — exact model states, activations walked layer by layer through the architecture,
a maximum over the forward, backward and optimizer phases, and labelled fixed overheads.

* :mod:`.inventory` — every parameter tensor of the model;
* :mod:`.states` — parameters, master weights, gradients, optimizer state and temporaries, exact;
* :mod:`.graph`, :mod:`.activations` — the forward walk and its saved tensors;
* :mod:`.phases` — per-phase peaks; :mod:`.overheads` — CUDA context, workspaces, allocator reserve;
* :mod:`.explain` — each component's formula, numbers and source;
* :mod:`.method` — the method itself (one setup, or arrays of setups) over a
  :class:`~trainfit.training_setup.TrainingSetup`.
"""
