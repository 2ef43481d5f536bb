"""Apache SINGA's formats, as SINGA v0.1.0 to v0.3.0 wrote them.

* :mod:`.confs` — every layer's ``*_conf`` block of SINGA's ``job.proto`` (the union of the
  three releases), declared once: the ``Config`` of paramserver's layers;
* :mod:`.layers` — SINGA's layer types, registered with their configuration; those not built
  yet are refused by ``paramserver train`` and listed by ``paramserver check``;
* :mod:`.records` — the protocol-buffer messages of SINGA's data and checkpoint files
  (``Record``, ``SingleLabelImageRecord``/``RecordProto``, ``BlobProtos``);
* :mod:`.stores` — SINGA's data stores: the ``kvfile`` store, v0.1.0's ``DataShard``, the
  ``textfile`` (CSV) store, and mean files;
* :mod:`.datasets` — ``paramserver data``: datasets written in those formats;
* :mod:`.checkpoints` — SINGA-layout checkpoints (``step<N>-worker<M>``).
"""
