"""Port 443: the server name a client asks for (its ClientHello), the
certificates minted per origin name, and each connection terminated, relayed
untouched, or refused."""
