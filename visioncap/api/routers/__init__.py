"""One router per resource; each route only reads its parameters and hands them to `ApiService`."""
