"""Training: layers (:mod:`.layers`), the net (:mod:`.net`) and its data (:mod:`.data`)."""
