/**
 * The nginx configuration in front of N replicas of `main.ts serve` (`deno task cluster`, and the
 * example `deploy/nginx.conf`, which is this function's output for three replicas on ports
 * 8001-8003; `tests/cluster_test.ts` checks they agree and that `nginx -t` accepts it).
 *
 * - Requests without a session key go to the replica with the fewest open connections
 *   (`least_conn`): a long generation holds its connection, so this balances running requests.
 * - Requests with an `X-Session-Id` header are placed by a consistent hash of it, so one
 *   conversation keeps reaching the replica whose prefix cache holds its history (and only
 *   1/N of the sessions move when a replica is added or removed).
 * - Streams pass unbuffered (`proxy_buffering off`), with read/send timeouts fit for long
 *   generations; a client that goes away closes the upstream connection, which aborts the
 *   request on its replica and frees its KV blocks.
 * - Passive health checks: a replica that refuses a connection or times out is skipped for
 *   `fail_timeout` (`max_fails=1`), and the request is retried on the next one when nothing has
 *   been sent yet (nginx never replays a POST that reached a replica).
 * - `X-Served-By` names the replica that answered; `/replicas/I/metrics` (I = 0..N-1) reaches each
 *   replica's Prometheus metrics through the balancer (the pooled `/metrics` is one replica's).
 *
 * @module
 */

/** What {@linkcode nginxConfig} needs. */
export interface NginxConfigOptions {
  /** Address and port nginx listens on, e.g. `127.0.0.1:8000`. */
  readonly listen: string;
  /** The replicas, e.g. `["127.0.0.1:8001", "127.0.0.1:8002"]`. */
  readonly replicas: readonly string[];
  /** Largest request body (nginx `client_max_body_size`), bytes. Default 1 MiB (as `serve`). */
  readonly maxBodyBytes?: number;
  /** Time a request head or body may take, s (nginx `client_*_timeout`). Default 30 (as `serve`). */
  readonly readTimeoutS?: number;
  /** Time a generation may go without a byte from its replica, s. Default 600. */
  readonly streamTimeoutS?: number;
  /** Where the error log goes. Default `stderr`. */
  readonly errorLog?: string;
}

/** The nginx configuration text for `options` (see the module documentation). */
export function nginxConfig(options: NginxConfigOptions): string {
  if (options.replicas.length === 0) throw new RangeError("Cannot balance 0 replicas");
  const maxBody = options.maxBodyBytes ?? 1 << 20;
  const readS = options.readTimeoutS ?? 30;
  const streamS = options.streamTimeoutS ?? 600;
  const servers = options.replicas.map((r) => `    server ${r} max_fails=1 fail_timeout=10s;`)
    .join("\n");
  const metrics = options.replicas.map((r, i) =>
    `    location = /replicas/${i}/metrics {\n      proxy_pass http://${r}/metrics;\n    }`
  ).join("\n");
  return `# nginx in front of ${options.replicas.length} replicas of \`main.ts serve\` (cli/nginx_config.ts).
# Run: nginx -p DIR -c DIR/nginx.conf (in the foreground; temporary files under DIR).
daemon off;
worker_processes auto;
pid nginx.pid;
error_log ${options.errorLog ?? "stderr"} warn;

events {
  worker_connections 4096;
}

http {
  access_log off;
  client_body_temp_path client_body;
  proxy_temp_path proxy;
  fastcgi_temp_path fastcgi;
  uwsgi_temp_path uwsgi;
  scgi_temp_path scgi;

${upstreams(servers)}
  map $http_x_session_id $llm_pool {
    "" llm_least_conn;
    default llm_session;
  }

  server {
    listen ${options.listen};
    client_max_body_size ${maxBody};
    client_body_buffer_size ${maxBody};
    client_header_timeout ${readS}s;
    client_body_timeout ${readS}s;
    keepalive_timeout 5s;

    proxy_http_version 1.1;
    proxy_set_header Connection "";
    # The client's Host goes through: the replicas' own Host check (DNS rebinding) still applies.
    proxy_set_header Host $http_host;
    proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
    proxy_buffering off;
    proxy_cache off;
    proxy_connect_timeout 2s;
    proxy_read_timeout ${streamS}s;
    proxy_send_timeout ${streamS}s;
    proxy_next_upstream error timeout;
    add_header X-Served-By $upstream_addr always;

    location / {
      proxy_pass http://$llm_pool;
    }
${metrics}
  }
}
`;
}

/** The two upstreams over the replicas' `server` lines: least connections, and by session. */
function upstreams(servers: string): string {
  return `  # Keyless requests: the replica with the fewest open connections.
  upstream llm_least_conn {
    least_conn;
${servers}
    keepalive 64;
    # Below the replicas' --keep-alive-timeout-s (5 s), so nginx never reuses a connection
    # that a replica is closing.
    keepalive_timeout 4s;
  }

  # Requests with a session key: the same replica for the same key (its prefix cache).
  upstream llm_session {
    hash $http_x_session_id consistent;
${servers}
    keepalive 64;
    keepalive_timeout 4s;
  }
`;
}
