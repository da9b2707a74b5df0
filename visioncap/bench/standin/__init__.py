"""`visioncap bench standin | fidelity`: a CPU stand-in sized to cost what a target model costs on a GPU class
(`sizing`), and the measurement of how close it comes (`fidelity`)."""
