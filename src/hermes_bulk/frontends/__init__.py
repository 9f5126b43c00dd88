"""What users type and read: the grammar, the replies both front ends give, views, terminal drawing."""
