"""Provider adapters: each turns one API's streaming format into MessageBuilder calls."""
