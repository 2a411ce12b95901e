/** The process logger. Credentials are redacted wherever they might appear. */
import { pino, type Logger } from 'pino';

// Exact paths only: wildcard paths make pino walk every logged object, on every access line.
export const redactedPaths = [
  'authorization',
  'apiKey',
  'key',
  'secret',
  'token',
  'headers',
  'req.headers',
  'options.apiKey',
  'options.headers',
];

export function createLogger(level: string, destination?: pino.DestinationStream): Logger {
  return pino({ level, base: undefined, redact: { paths: redactedPaths, censor: '[redacted]' } }, destination);
}
