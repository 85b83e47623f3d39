"""Op families built on ``make_op``: generic elementwise (:mod:`.elementwise`) and reductions (:mod:`.reductions`)."""
