"""Configuration: settings from the environment and .env, what a store URL names, where logs go."""
