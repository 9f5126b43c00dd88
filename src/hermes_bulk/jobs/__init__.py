"""What a job is and what can be done to one: the service API, the prompt, exports."""
