/**
 * Who is really calling, when a TLS-terminating proxy sits in front: the `X-Forwarded-*` headers
 * are believed only when the TCP peer is one of `server.trustedProxies` (addresses or CIDRs), since
 * anyone else can write them.
 */
import { BlockList, isIPv4, isIPv6 } from 'node:net';

/** The client as seen through trusted proxies. */
export interface ForwardedView {
  /** The client's address: the peer, or the rightmost untrusted `X-Forwarded-For` hop. */
  client: string;
  /** The client reached the proxy over TLS (`X-Forwarded-Proto: https`). */
  https: boolean;
  /** The host the client asked for (`X-Forwarded-Host`, else `Host`). */
  host: string | undefined;
}

/**
 * An address in one canonical text form (IPv4 dotted, IPv6 compressed lowercase, IPv4-mapped IPv6
 * as IPv4), or undefined when the text is not an IP address. uWebSockets.js writes IPv6 peers
 * uncompressed (`0000:…:0001`), so every comparison goes through this.
 */
export function canonicalAddress(text: string): string | undefined {
  const address = text.trim();
  if (isIPv4(address)) return address;
  // A zone (`fe80::1%eth0`) names a local interface, never a client on the internet.
  if (!isIPv6(address) || address.includes('%')) return undefined;
  const compressed = new URL(`http://[${address}]/`).hostname.slice(1, -1);
  const mapped = /^::ffff:([0-9a-f]{1,4}):([0-9a-f]{1,4})$/.exec(compressed);
  if (!mapped) return compressed;
  const [hi, lo] = [parseInt(mapped[1]!, 16), parseInt(mapped[2]!, 16)];
  return `${hi >> 8}.${hi & 255}.${lo >> 8}.${lo & 255}`;
}

/** Parses `10.0.0.0/8`, `::1` or `fd00::/8`; throws with the reason otherwise. */
export function parseAddressRange(entry: string): { address: string; prefix: number; family: 'ipv4' | 'ipv6' } {
  const [text, bits, extra] = entry.split('/');
  const address = canonicalAddress(text ?? '');
  if (!address || extra !== undefined) throw new Error(`"${entry}" is not an IP address or CIDR range`);
  const family = isIPv4(address) ? 'ipv4' : 'ipv6';
  const max = family === 'ipv4' ? 32 : 128;
  const prefix = bits === undefined ? max : Number(bits);
  if (!/^\d{1,3}$/.test(bits ?? String(max)) || prefix > max) throw new Error(`"${entry}": the prefix length must be 0–${max}`);
  return { address, prefix, family };
}

export class TrustedProxies {
  private readonly list = new BlockList();
  private readonly empty: boolean;

  constructor(entries: readonly string[]) {
    for (const entry of entries) {
      const { address, prefix, family } = parseAddressRange(entry);
      this.list.addSubnet(address, prefix, family);
    }
    this.empty = entries.length === 0;
  }

  trusts(address: string | undefined): boolean {
    if (this.empty || !address) return false;
    return this.list.check(address, isIPv4(address) ? 'ipv4' : 'ipv6');
  }

  /** The client, scheme and host of a request whose TCP peer is `peer`. */
  view(peer: string, headers: Record<string, string>): ForwardedView {
    const direct = canonicalAddress(peer) ?? peer;
    if (!this.trusts(direct)) return { client: direct, https: false, host: headers.host };
    return {
      client: this.clientBehind(direct, headers['x-forwarded-for']),
      https: firstValue(headers['x-forwarded-proto'])?.toLowerCase() === 'https',
      host: firstValue(headers['x-forwarded-host']) || headers.host,
    };
  }

  /** Walks `X-Forwarded-For` from the right past trusted hops; the first other hop is the client. */
  private clientBehind(peer: string, forwardedFor: string | undefined): string {
    let client = peer;
    const hops = forwardedFor?.split(',') ?? [];
    for (let i = hops.length - 1; i >= 0 && this.trusts(client); i--) {
      const hop = canonicalAddress(hops[i]!);
      // A hop that is not an address was written by someone untrusted: stop at the last good one.
      if (!hop) break;
      client = hop;
    }
    return client;
  }
}

/** The first of a comma-separated header's values, as the proxy nearest the client set it. */
function firstValue(header: string | undefined): string | undefined {
  return header?.split(',')[0]!.trim() || undefined;
}
