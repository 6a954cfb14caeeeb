"""The drivers' flags (`driver_flags`), settings (`driver_config.DriverConfig`), `main` (`driver`) and
data files (`sqlite_data`, `sqlite_population`); their run is `dp_ftrl_tff.training`'s."""
