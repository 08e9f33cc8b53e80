"""The mTLS + HTTP/2 link both daemons speak: h2 events turned into trio streams."""
