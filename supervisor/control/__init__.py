"""Control: the credentialed side (policy, DNS, upstream egress, L7, credentials, operator API)."""
