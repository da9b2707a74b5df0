"""`visioncap bench mixed`: interactive chat beside a camera caption flood (`run`: the set-ups, `main`: run and
write, `report`), with the probes it takes (`calibrate`, `frontier`, `phase_costs`) and the studies built on its
set-ups (`hop_ttft`, `client_stalls`)."""
