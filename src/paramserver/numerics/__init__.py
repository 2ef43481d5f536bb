"""Everything numba compiles, and the rules of its compilation and cache.

- :mod:`.cache`: where compiled code is kept, how it is keyed, locked, checked and refused
  (the one place that answers "can a second process crash loading what the first compiled?");
- :mod:`.kernels`: the dense update kernels' Python side, one launch for every rule (numba
  only where a call takes a compiled kernel); :mod:`.rules` the per-element rules;
  :mod:`.fused` the compiled kernels, one factory for every rule; :mod:`.small_updates` and
  :mod:`.rng_arrays` the NumPy forms of small calls (:mod:`.forms` says when they are taken);
  :mod:`.compile_events` who hears that a kernel compiles;
- :mod:`.rows`: the row-sparse update kernels of tables;
- :mod:`.quant`: the bfloat16 and 8-bit codecs of updater state, with their NumPy reference;
- :mod:`.rng`: the counter-based random fills of initialisation (their keys and arguments;
  :mod:`.rng_kernels` their compiled fillers);
- :mod:`.norm`: the global gradient norm;
- :mod:`.sums`: the cluster's elementwise sum of gradients.

Importing this package imports nothing: numba loads only with the first module that needs it
(``import paramserver`` stays fast), and a job whose calls all take the NumPy forms never
loads it.
"""
