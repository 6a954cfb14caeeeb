"""Privacy accounting without TensorFlow: rho-zCDP and (epsilon, delta) of correlated-noise mechanisms.

Modules:
  * `zcdp`: rho = sens^2 / (2 sigma^2) from a `mechanisms` strategy, and (epsilon, delta) through
    dp_accounting's PLD accountant on one Gaussian event with noise multiplier 1 / sqrt(2 rho).
  * `calibration`: the noise multiplier that meets a target rho or a target (epsilon, delta).
  * `adaptive_clipping`: the noise inflation of adaptive quantile clipping (Gboard paper, Thm. 1).
  * `participation_log`: reads a `client_id,round` participation log; realized min_sep and
    max participations.
  * `report`: the privacy report (JSON, markdown checklist, plots).

Importing this package never imports TensorFlow (a test checks it).
"""
