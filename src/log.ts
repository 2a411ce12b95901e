/** The process logger. Credentials are redacted wherever they might appear. */
import { pino, type Logger } from 'pino';

export const redactedPaths = [
  'authorization',
  'apiKey',
  'key',
  'secret',
  'token',
  '*.authorization',
  '*.apiKey',
  '*.secret',
  '*.token',
  '*["x-api-key"]',
  '*["x-goog-api-key"]',
  '*["x-svc-api-key"]',
  'headers.*',
];

export function createLogger(level: string, destination?: pino.DestinationStream): Logger {
  return pino({ level, base: undefined, redact: { paths: redactedPaths, censor: '[redacted]' } }, destination);
}
