"""Privacy accounting without TensorFlow: rho-zCDP and (epsilon, delta) of correlated-noise mechanisms.

Modules:
  * `zcdp`: rho = sens^2 / (2 sigma^2) from a `mechanisms` strategy, and (epsilon, delta) through
    dp_accounting's PLD accountant on one Gaussian event with noise multiplier 1 / sqrt(2 rho).
  * `calibration`: the noise multiplier that meets a target rho or a target (epsilon, delta).
  * `participation_log`: the `client_id,round` participation log: its format, writer and reader;
    realized min_sep and max participations.
  * `report`: the privacy report's data and computation (`PrivacyReport`, `build_report`).
  * `report_render`: the report as JSON, terminal summary, markdown checklist and plots.

The run plan it reads (`dp_ftrl_tff.plan`) holds the adaptive-clipping noise split (Gboard Thm. 1).
Importing this package never imports TensorFlow (a test checks it).
"""
