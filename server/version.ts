/**
 * This server's version, as `GET /version` reports it: the `version` of deno.json (a test keeps
 * the two equal; the server does not read deno.json, which belongs to no layer).
 *
 * @module
 */

/** The version in deno.json. */
export const VERSION = "0.1.0";
