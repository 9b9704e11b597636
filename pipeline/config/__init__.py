"""Settings: one typed object per process, built from defaults, a TOML file and the environment."""
