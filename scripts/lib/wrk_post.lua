-- wrk script of scripts/bench-proxy: every request POSTs JSON with the bearer key BENCH_KEY.
-- BENCH_BODY names the body's file, or several separated by ':' sent in turn; a run of nine '#'
-- in a body is replaced by the request's number (counted from BENCH_FIRST, default 0), so no two
-- bodies are alike. With BENCH_STOP_AFTER=N the thread stops after N answers (wrk itself still
-- runs until its -d is up). At the end one JSON line gives the counts and latencies (us).
local bodies = {}
for path in string.gmatch(assert(os.getenv("BENCH_BODY"), "BENCH_BODY not set"), "[^:]+") do
  local f = assert(io.open(path, "rb"))
  bodies[#bodies + 1] = f:read("*a")
  f:close()
end
local numbered = string.find(bodies[1], "#########", 1, true) ~= nil
local stop_after = tonumber(os.getenv("BENCH_STOP_AFTER") or "")
local sent, answered = tonumber(os.getenv("BENCH_FIRST") or "0"), 0

wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. assert(os.getenv("BENCH_KEY"), "BENCH_KEY not set")
wrk.body = bodies[1]

if numbered or #bodies > 1 then
  function request()
    sent = sent + 1
    local body = bodies[sent % #bodies + 1]
    if numbered then
      body = string.gsub(body, "#########", string.format("%09d", sent), 1)
    end
    return wrk.format(nil, nil, nil, body)
  end
end

if stop_after then
  function response(status, headers, body)
    answered = answered + 1
    if answered >= stop_after then
      wrk.thread:stop()
    end
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests":%d,"duration_us":%d,"p50_us":%d,"p99_us":%d,"non_2xx":%d,"socket_errors":%d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.status, e.connect + e.read + e.write + e.timeout))
end
