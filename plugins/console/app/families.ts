/** What each wire family is, in words an operator recognises. */
export const familyInfo: Record<string, { label: string; path: string }> = {
  chat: { label: 'Chat completions', path: '/v1/chat/completions' },
  responses: { label: 'Responses', path: '/v1/responses' },
  gemini: { label: 'Content generation', path: '/v1beta/models/…' },
  messages: { label: 'Messages', path: '/v1/messages' },
};

export const familyLabel = (f: string) => familyInfo[f]?.label ?? f;
