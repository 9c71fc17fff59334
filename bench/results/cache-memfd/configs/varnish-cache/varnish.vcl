# Varnish for `bench/run --cache`. Filled in at run time by bench/harness/cache.py.
# varnishd runs with `-s malloc,CACHE_MEMORY` (memory storage) and `-t TTL_S` (the TTL of
# answers that say nothing about caching, as veloxy-upstream's; the storm upstream's
# Cache-Control: max-age=60 wins over it); threads and pinning are on its command line (see
# configs/varnish-cache/command.txt). /storm/ goes to the harness's counting upstream,
# everything else to veloxy-upstream. Varnish reuses backend connections (keep-alive), adds
# X-Forwarded-For and coalesces concurrent misses of one object by itself (waiting list);
# the built-in VCL runs after this one (no return here). vcl_deliver adds X-Cache: HIT or MISS
# (obj.hits), the harness's check that answers come from the cache (veloxy sends X-Cache,
# nginx X-Cache-Status: one header each).
vcl 4.1;

backend app {
    .host = "127.0.0.1";
    .port = "33313";
}

backend storm {
    .host = "127.0.0.1";
    .port = "51727";
}

sub vcl_recv {
    if (req.url ~ "^/storm/") {
        set req.backend_hint = storm;
    } else {
        set req.backend_hint = app;
    }
}

sub vcl_deliver {
    if (obj.hits > 0) {
        set resp.http.X-Cache = "HIT";
    } else {
        set resp.http.X-Cache = "MISS";
    }
}
